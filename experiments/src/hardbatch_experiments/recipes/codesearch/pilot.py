"""The encoding-time pilot of the code-search grid: how long the starting model takes to embed
the training queries and codes (the cost of mining hard negatives, of a teacher's embeddings and
of a refresh from the trained model), at each code token limit.

::

    python -m hardbatch_experiments.recipes.codesearch.pilot --code-lengths 128,256 \\
        --threads 2 --out results/code_search/pilots

writes ``OUT/encoding__LCODE__qQUERY__nN.json`` per code limit (seconds for the queries and for
the codes, texts per second, the machine). Training seconds per step come from short
``hardbatch bench codesearch --steps 10`` runs (their JSON's ``seconds_per_step``).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from ... import runs
from ...sts import load_sentence_transformer
from .data import load_code_pairs, split_path
from .model import encode_texts, library_versions
from .run import MODEL

__all__ = ["build_parser", "main", "time_encoding"]


def time_encoding(model, texts: list[str], max_length: int, batch_size: int) -> dict:
    """Seconds (wall and CPU, all threads) to embed ``texts`` with ``max_length`` tokens, texts
    per second, and the machine's load average at the end."""
    t0, c0 = time.perf_counter(), time.process_time()
    encode_texts(model, texts, max_length, batch_size)
    seconds = time.perf_counter() - t0
    return {"texts": len(texts), "max_length": max_length, "seconds": seconds,
            "cpu_seconds": time.process_time() - c0,
            "texts_per_s": len(texts) / seconds if seconds > 0 else None,
            "load_average": os.getloadavg()}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hardbatch_experiments.recipes.codesearch.pilot",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--code-lengths", default="128,256",
                   help="code token limits, comma-separated (default 128,256)")
    p.add_argument("--max-query-length", type=int, default=64)
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="the first N training pairs only (default: all)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", default=MODEL)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default="results/code_search/pilots")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    pairs = load_code_pairs(split_path("train", args.data_dir), limit=args.limit)
    model = load_sentence_transformer(args.model)
    queries = time_encoding(model, pairs.queries, args.max_query_length, args.batch_size)
    print(f"[pilot] {queries['texts']} queries at {args.max_query_length} tokens: "
          f"{queries['seconds']:.0f}s", flush=True)
    for length in (int(x) for x in args.code_lengths.split(",")):
        codes = time_encoding(model, pairs.codes, length, args.batch_size)
        print(f"[pilot] {codes['texts']} codes at {length} tokens: {codes['seconds']:.0f}s",
              flush=True)
        path = Path(args.out) / f"encoding__L{length}q{args.max_query_length}__n{len(pairs)}.json"
        runs.write_json_atomic(path, {
            "pilot": "encoding of the training set by the starting model",
            "queries": queries, "codes": codes,
            "total_seconds": queries["seconds"] + codes["seconds"],
            "batch_size": args.batch_size, "threads": args.threads, "model": args.model,
            "command": "python -m hardbatch_experiments.recipes.codesearch.pilot "
                       f"--code-lengths {length} --max-query-length {args.max_query_length} "
                       f"--threads {args.threads}"
                       + (f" --limit {args.limit}" if args.limit else ""),
            "env": {**runs.env_record(), **library_versions()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
