#!/usr/bin/env python3
"""Writes testdata/golden/tokenizer.json: the reference model's tokenizer as
Hugging Face transformers exports it from the GGUF file, for the worker's
`hf-json` tokenizer (M0-W-1361). Nothing of the worker's own code is used.

    python3 -m venv /tmp/venv-hf
    /tmp/venv-hf/bin/pip install transformers==4.57.6 tokenizers==0.22.2 gguf==0.19.0 \\
        numpy sentencepiece protobuf
    /tmp/venv-hf/bin/python testdata/golden/make_tokenizer_json.py \\
        .models/smollm2-135m-instruct-q4_1.gguf testdata/golden/tokenizer.json

transformers 4.x, because 5.x's GGUF reader imports torch at the top. 4.x's
`load_gguf_checkpoint` also refuses to run without torch, although with
`return_tensors=False` (all a tokenizer asks for) it never touches it: the
script tells that check torch is there instead of installing a GPU build of it.

Then it checks what it wrote, with the `tokenizers` library alone: every
vector of tokenize.json (llama.cpp's ids) must encode to the same ids, and
the file must hold the GGUF's 49,152 tokens.
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path

import transformers
import transformers.modeling_gguf_pytorch_utils as gguf_utils
from tokenizers import Tokenizer
from transformers import AutoTokenizer

HERE = Path(__file__).resolve().parent


def export(model: Path, out: Path) -> None:
    gguf_utils.is_torch_available = lambda: True
    tok = AutoTokenizer.from_pretrained(str(model.parent), gguf_file=model.name)
    with tempfile.TemporaryDirectory() as tmp:
        tok.save_pretrained(tmp)
        shutil.copyfile(Path(tmp) / "tokenizer.json", out)


def check(out: Path) -> None:
    t = Tokenizer.from_file(str(out))
    assert t.get_vocab_size(with_added_tokens=True) == 49152, t.get_vocab_size()
    cases = json.loads((HERE / "tokenize.json").read_text())
    bad = []
    for c in cases:
        # parse_special=false: special tokens' text is plain text.
        t.encode_special_tokens = not c["parse_special"]
        ids = t.encode(c["text"], add_special_tokens=c["add_bos"]).ids
        if ids != c["ids"]:
            bad.append(f"{c['name']} (parse_special={c['parse_special']}): {ids} != {c['ids']}")
    print(f"{out}: {len(cases) - len(bad)}/{len(cases)} golden vectors match llama.cpp")
    if bad:
        sys.exit("\n".join(bad))


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    model, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    print(f"transformers {transformers.__version__}")
    export(model, out)
    check(out)


if __name__ == "__main__":
    main()
