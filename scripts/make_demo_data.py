"""Make the demo's instruction data set and its plain-text pretraining corpus.

The tasks have answers that can be checked exactly (arithmetic on small numbers, reversing, spelling,
upper-casing and counting the letters of a word, sorting a few letters or digits), so the demo can show
exact-match accuracy as well as loss.

Two outputs, both seeded and byte-for-byte reproducible:

* ``train.json`` / ``heldout.json`` (Alpaca format: a list of ``{"instruction", "input", "output"}``):
  the finetuning data. Held-out (instruction, input) pairs never occur in the training file.
* the pretraining corpus: the same facts written as plain sentences ("7 plus 5 is 12."), never in the
  Alpaca prompt format, so a base model pretrained on it knows the facts but not the instruction format.
  It is not committed; ``scripts/pretrain_demo_model.py`` and ``scripts/train_demo_tokenizer.py`` call
  :func:`pretraining_corpus` to regenerate it (``--corpus PATH`` writes it out for a look).

Usage::

    python scripts/make_demo_data.py                      # writes torchtune/assets/demo/{train,heldout}.json
    python scripts/make_demo_data.py --out-dir /tmp/demo --corpus /tmp/demo/corpus.txt
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SEED = 1234
DEFAULT_OUT_DIR = Path(__file__).resolve().parent.parent / "torchtune" / "assets" / "demo"

# Common short English words. Inline (not read from /usr/share/dict) so the output does not depend on
# the machine. Every word-level task draws from this list.
WORDS = """
able acid aged also area army away baby back ball band bank base bath bear beat bell belt best bird
blue boat body bone book boot born boss both bowl bread brick bride brown build burn busy cake call
calm camp card care cart case cash cast cat chain chair chalk cheap check chest chief child city
class clean clear clock cloud coal coat code cold color cook cool copy corn cost crowd crown cup
dance dark data date dawn deal dear deep desk diet dirt dish dog door down draw dream dress drink
drive drop drum duck dust duty eagle early earth east easy edge egg eight empty enemy enjoy entry
equal event exact exit face fact fair fall farm fast fear feast field fifty film find fire fish
five flag flat floor flow fly food foot fork form fort four fox free fresh frog front fruit full
game gate gift girl glad glass goal gold golf good grain grass great green grey group guard guest
guide hair half hall hand happy hard hat head heart heat heavy help hero high hill home honey hope
horse hotel hour house human hunt ice idea image inch iron island jam jazz job join joke judge juice
jump kept key kid kind king kite knee knife lake lamp land large laser last late laugh lawn lead
leaf left lemon level light lime line lion list live lock long lost loud love low lucky lunch
magic main major map march mark mask match meal meat metal milk mind mint model money month moon
motor mouse mouth movie music nail name nest never new nice night nine noise north nose note novel
nurse ocean offer oil old olive onion open orange order other owl owner page paint pair paper park
party pasta path peace pearl pen piano pilot pink pipe pizza place plane plant plate play poem
point pond pool pork post pot power press price pride print prize proud pump queen quick quiet
radio rain range rapid rare rat reach ready red rice rich ride right ring river road robot rock
roof room root rope rose round royal rule salad salt sand scale scene school sea seat seed seven
shade shape sharp sheep shelf shell shirt shoe shop short show sign silk silver sing sink six size
skill skin sky sleep slow small smile smoke snake snow soap sock soft solid song soup south space
spice spoon sport star steam steel stick stone storm story sugar sun sweet swim table tail tea
team teeth tent test three tiger time toast today tool tooth topic tower town toy track train tree
trip truck true tulip two uncle union upper urban value van video view voice wagon walk wall warm
watch water wave wheat wheel white wind window wine winter wise wolf woman wood word work world
worm yard year yellow young zebra zero zone
""".split()

# The instruction wording of each task; a task's held-out inputs are never in its training inputs.
TASKS_PER_SPLIT = {  # task: (train count, held-out count)
    "add": (380, 25),
    "subtract": (200, 25),
    "reverse": (300, 25),
    "spell": (300, 25),
    "upper": (300, 25),
    "count": (300, 25),
    "sort_digits": (610, 25),
    "sort_letters": (610, 25),
}
ADD_MAX = 20  # sums of two numbers in 0..20: few enough that a tiny model can learn them all
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _example(instruction: str, input_: str, output: str) -> dict[str, str]:
    return {"instruction": instruction, "input": input_, "output": output}


def _sort_digits_inputs(rng: random.Random, n: int) -> list[str]:
    seen: dict[str, None] = {}
    while len(seen) < n:
        k = rng.randint(3, 5)
        seen[" ".join(str(rng.randint(0, 9)) for _ in range(k))] = None
    return list(seen)


def _sort_letters_inputs(rng: random.Random, n: int) -> list[str]:
    seen: dict[str, None] = {}
    while len(seen) < n:
        k = rng.randint(3, 5)
        seen[" ".join(rng.sample(LETTERS, k))] = None
    return list(seen)


def _task_pool(task: str, rng: random.Random, n: int) -> list[dict[str, str]]:
    """Up to ``n`` distinct examples of ``task``, in a seeded random order."""
    if task == "add":
        pairs = [(a, b) for a in range(ADD_MAX + 1) for b in range(ADD_MAX + 1)]
        rng.shuffle(pairs)
        return [_example(f"What is {a} plus {b}?", "", str(a + b)) for a, b in pairs[:n]]
    if task == "subtract":
        pairs = [(a, b) for a in range(ADD_MAX + 1) for b in range(a + 1)]
        rng.shuffle(pairs)
        return [
            _example("Subtract the second number from the first.", f"{a} and {b}", str(a - b)) for a, b in pairs[:n]
        ]
    words = sorted(set(WORDS))
    rng.shuffle(words)
    words = words[:n]
    if task == "reverse":
        return [_example("Reverse the letters of the word.", w, w[::-1]) for w in words]
    if task == "spell":
        return [_example(f"Spell the word {w} letter by letter.", "", " ".join(w)) for w in words]
    if task == "upper":
        return [_example("Write the word in capital letters.", w, w.upper()) for w in words]
    if task == "count":
        return [_example(f'How many letters are in the word "{w}"?', "", str(len(w))) for w in words]
    if task == "sort_digits":
        return [
            _example("Sort the numbers from smallest to largest.", s, " ".join(sorted(s.split(), key=int)))
            for s in _sort_digits_inputs(rng, n)
        ]
    if task == "sort_letters":
        return [
            _example("Sort the letters in alphabetical order.", s, " ".join(sorted(s.split())))
            for s in _sort_letters_inputs(rng, n)
        ]
    raise ValueError(f"unknown task {task!r}")


def make_splits(seed: int = SEED) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Return ``(train, heldout)``: Alpaca-format examples with disjoint (instruction, input) pairs."""
    rng = random.Random(seed)
    train: list[dict[str, str]] = []
    heldout: list[dict[str, str]] = []
    for task, (n_train, n_heldout) in TASKS_PER_SPLIT.items():
        pool = _task_pool(task, rng, n_train + n_heldout)
        heldout.extend(pool[:n_heldout])
        train.extend(pool[n_heldout : n_heldout + n_train])
    rng.shuffle(train)
    rng.shuffle(heldout)
    return train, heldout


# ---------------------------------------------------------------------------------------------------
# Plain-text pretraining corpus: the same skills as sentences, never in the instruction format.


def _fact(rng: random.Random) -> str:
    kind = rng.choice(("add", "add", "sub", "spell", "reverse", "upper", "count", "sort_d", "sort_l", "words"))
    word = rng.choice(WORDS)
    if kind == "add":
        a, b = rng.randint(0, ADD_MAX), rng.randint(0, ADD_MAX)
        return rng.choice((f"{a} plus {b} is {a + b}.", f"{a} + {b} = {a + b}."))
    if kind == "sub":
        a = rng.randint(0, ADD_MAX)
        b = rng.randint(0, a)
        return rng.choice((f"{a} minus {b} is {a - b}.", f"{a} - {b} = {a - b}."))
    if kind == "spell":
        return f"{word} is spelled {' '.join(word)}."
    if kind == "reverse":
        return f"{word} backwards is {word[::-1]}."
    if kind == "upper":
        return f"{word} in capitals is {word.upper()}."
    if kind == "count":
        return f"the word {word} has {len(word)} letters."
    if kind == "sort_d":
        digits = [str(rng.randint(0, 9)) for _ in range(rng.randint(3, 5))]
        return f"in order, {' '.join(digits)} becomes {' '.join(sorted(digits, key=int))}."
    if kind == "sort_l":
        letters = rng.sample(LETTERS, rng.randint(3, 5))
        return f"in order, {' '.join(letters)} becomes {' '.join(sorted(letters))}."
    return "words: " + ", ".join(rng.sample(WORDS, rng.randint(3, 8))) + "."


def pretraining_corpus(num_documents: int = 20000, seed: int = SEED) -> list[str]:
    """Plain-text documents of 4-10 facts each (one document per list item, no newlines)."""
    rng = random.Random(seed + 1)
    return [" ".join(_fact(rng) for _ in range(rng.randint(4, 10))) for _ in range(num_documents)]


def write_json(examples: list[dict[str, str]], path: Path) -> None:
    """Write ``examples`` as indented JSON with a trailing newline (stable bytes across runs)."""
    path.write_text(json.dumps(examples, indent=1, ensure_ascii=True) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=DEFAULT_OUT_DIR,
        help="folder for train.json and heldout.json (default: the committed bundle)",
    )
    parser.add_argument(
        "--corpus",
        type=Path,
        default=None,
        help="also write the plain-text pretraining corpus here (one document a line)",
    )
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)

    train, heldout = make_splits(args.seed)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_json(train, args.out_dir / "train.json")
    write_json(heldout, args.out_dir / "heldout.json")
    print(f"wrote {len(train)} training and {len(heldout)} held-out examples to {args.out_dir}")
    if args.corpus is not None:
        args.corpus.parent.mkdir(parents=True, exist_ok=True)
        args.corpus.write_text("\n".join(pretraining_corpus(seed=args.seed)) + "\n", encoding="utf-8")
        print(f"wrote the pretraining corpus to {args.corpus}")


if __name__ == "__main__":
    main()
