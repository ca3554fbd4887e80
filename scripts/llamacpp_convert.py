"""Run llama.cpp's convert_hf_to_gguf.py on a relaxspec model (see scripts/llamacpp_peer.sh).

Our tokenizer's pre-tokenizer (digits split one by one, then GPT-2's byte-level regex) is the one
llama.cpp calls "smollm", but the converter recognises pre-tokenizers by a hash of the tokens of a
fixed text, and ours is not in its table: this wrapper names it, then runs the converter.
Usage: python llamacpp_convert.py LLAMA_CPP_DIR MODEL_DIR --outtype bf16 --outfile OUT.gguf
"""

import runpy
import sys
from pathlib import Path

root = Path(sys.argv[1]).resolve()
sys.path[:0] = [str(root), str(root / "gguf-py")]
import conversion.base as base  # noqa: E402  (llama.cpp's converter package)

owner = next(c for c in vars(base).values() if isinstance(c, type) and "get_vocab_base_pre" in vars(c))
owner.get_vocab_base_pre = lambda self, tokenizer: "smollm"
sys.argv = [str(root / "convert_hf_to_gguf.py"), *sys.argv[2:]]
runpy.run_path(str(root / "convert_hf_to_gguf.py"), run_name="__main__")
