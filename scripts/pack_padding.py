"""How much of a packed dataset is padding: torchtune's greedy packing against best fit (``best_fit: True``),
with the Alpaca text as it is (``chat_format: plain_text``) and in Llama 2's ``[INST]`` template (torchtune's
default), on the Alpaca-like rows of ``benchmarks/compare_torchtune.py`` (instructions of 5-28 tokens, an input
in 40% of rows, answers with a long tail) and a SentencePiece tokenizer trained on them.

    PYTHONPATH=. python scripts/pack_padding.py --rows 3000 --max-seq-len 512

Counts only (no timing): the same numbers on any machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.compare_torchtune import ALPACA_PROMPT, alpaca_like_rows, make_tokenizer  # noqa: E402
from torchtune.datasets import alpaca_dataset  # noqa: E402
from torchtune.models.llama2 import llama2_tokenizer  # noqa: E402


def main(argv: list = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--max-seq-len", type=int, default=512)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rows = alpaca_like_rows(args.rows)
        (work / "data.json").write_text(json.dumps(rows))
        corpus = [ALPACA_PROMPT] * 20 + [" ".join(r.values()) for r in rows[:400]]
        tokenizer = llama2_tokenizer(str(make_tokenizer(work / "tok", corpus, 32000)))
        print("| chat_format | packing | packs | padding |\n|---|---|---|---|")
        for chat_format in ("plain_text", "tokenizer"):
            for best_fit in (False, True):
                packed = alpaca_dataset(
                    tokenizer,
                    source="json",
                    data_files=str(work / "data.json"),
                    train_on_input=False,
                    max_seq_len=args.max_seq_len,
                    packed=True,
                    best_fit=best_fit,
                    chat_format=chat_format,
                    cache_dir=str(work / "cache"),
                )
                packing = "best fit" if best_fit else "greedy (torchtune's)"
                print(f"| {chat_format} | {packing} | {len(packed)} | {100 * packed.padding_share:.1f}% |")


if __name__ == "__main__":
    main()
