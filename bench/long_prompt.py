"""Write a JSONL prompt file: a short chat prompt and a long (~N tokens) one, for figures and benches.

The long prompt is Python standard-library source (present on every machine, no download), cut
to the target token count with the model's own tokenizer.
    python bench/long_prompt.py --tokens 9000 --out /tmp/prompts.jsonl [--model demo]
"""
from __future__ import annotations

import argparse
import inspect
import json

SHORT = "Give me a brief explanation of gravity in simple terms."


def long_text(tokenizer, target: int) -> str:
    import argparse as a, collections, dataclasses, inspect as i, pathlib, textwrap, typing  # noqa: E401

    src = "\n\n".join(inspect.getsource(m) for m in (a, dataclasses, pathlib, collections, textwrap, typing, i))
    ids = tokenizer(src, add_special_tokens=False)["input_ids"][:target]
    return tokenizer.decode(ids)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=9000, help="tokens of source text in the long prompt")
    ap.add_argument("--model", default="demo")
    ap.add_argument("--out", required=True)
    ap.add_argument("--only-long", action="store_true")
    args = ap.parse_args()
    from parity_ui.inputs.models import describe_model
    from parity_ui.inputs.prompts import tokenizer_for

    tok = tokenizer_for(describe_model(args.model).path).tok
    body = long_text(tok, args.tokens)
    rows = [] if args.only_long else [{"messages": [{"role": "user", "content": SHORT}]}]
    rows.append({"messages": [{"role": "user", "content": "Here is some Python source code. Summarize what it "
                                                          "does, module by module.\n\n" + body}]})
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(args.out)


if __name__ == "__main__":
    main()
